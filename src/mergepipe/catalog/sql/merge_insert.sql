INSERT INTO merges (merge_id, status, operator, base, request, params, seed, output_name,
                    output_path, request_id)
VALUES (:merge_id, 'queued', :operator, :base, :request, :params, :seed, :output_name,
        :output_path, :request_id)
