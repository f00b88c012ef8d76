UPDATE models SET path = :path WHERE name = :name
