UPDATE merges
SET status = 'failed', finished_at = current_timestamp,
    error = 'the server stopped while this merge was running; nothing was published; submit it again'
WHERE status = 'running'
