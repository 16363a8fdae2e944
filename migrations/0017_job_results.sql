-- How a training job ended and the end of its log, kept after its pods and containers are
-- gone: the reconciler records it when it sees the job finish (and then releases the
-- job's capacity), or just before teardown stops a job that is still running.
CREATE TABLE job_results (
    environment_id TEXT    PRIMARY KEY REFERENCES environments (id),
    -- backend::JobStatus as JSON.
    status         TEXT    NOT NULL CHECK (json_valid(status)),
    -- The last lines, oldest first, as a JSON array of strings.
    lines          TEXT    NOT NULL CHECK (json_valid(lines) AND json_type(lines) = 'array'),
    recorded_at    INTEGER NOT NULL
);
