-- The SlideDP run log, schema version 5 (docs/RUN_LOG.md). runlog/open_log.cc embeds this file and
-- runs it once, in one transaction, on an empty database; it is the only place the schema is defined.
-- Writers go through RunLog; readers (planner, fidelity tools, people with the sqlite3 shell) should
-- prefer the views at the end, which stay stable when tables gain columns.
-- Units are in column names (_s seconds, _bytes bytes); times of day are ISO-8601 UTC text with
-- milliseconds ("2026-11-29T21:45:03.125Z"), which julianday() reads.

CREATE TABLE runs (
  id               INTEGER PRIMARY KEY,
  kind             TEXT    NOT NULL CHECK (kind IN ('train', 'profile', 'refine', 'sweep')),
  -- A refine or sweep run groups the train runs it started.
  parent_run_id    INTEGER REFERENCES runs (id) ON DELETE SET NULL,
  started_at       TEXT    NOT NULL,
  ended_at         TEXT,   -- NULL while running, and forever when the process was killed
  -- Written once at begin_run ('running') and once at end_run. A SIGKILLed run stays 'running' with
  -- ended_at NULL; RunLogReader::run_status tells it apart from a live one by its pid.
  status           TEXT    NOT NULL DEFAULT 'running'
                           CHECK (status IN ('running', 'finished', 'failed', 'interrupted')),
  -- The writing process: pid plus its start time in clock ticks after boot and the boot id, so a
  -- recycled pid (or a reboot) is not mistaken for the run still being alive.
  pid              INTEGER NOT NULL,
  pid_start_ticks  INTEGER,
  boot_id          TEXT,
  host             TEXT    NOT NULL,
  git_revision     TEXT    NOT NULL,
  build_type       TEXT    NOT NULL,
  slidedp_version  TEXT    NOT NULL,
  command_line     TEXT    NOT NULL DEFAULT '',
  backend          TEXT,   -- 'cpu' | 'cuda'; NULL for runs that use none (a sweep's parent row)
  plan_yaml        TEXT,   -- the plan file as run (model/plan.h plan_file_to_yaml)
  plan_summary     TEXT,   -- Plan::summary(), for tables: "4 ranks x mb 2 x acc 1 | sharded/cpu | ..."
  hardware_name    TEXT,
  hardware_yaml    TEXT,   -- the hardware profile the prediction used
  model_name       TEXT,
  seq_len          INTEGER CHECK (seq_len IS NULL OR seq_len > 0),
  system           TEXT,   -- 'slidedp' or a baseline preset name
  notes_json       TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(notes_json)),
  last_seen_at     TEXT    NOT NULL,  -- time of the run's latest write (a heartbeat for readers)
  CHECK (ended_at IS NULL OR status <> 'running')
);
CREATE INDEX runs_by_parent ON runs (parent_run_id);

-- One row per optimizer step. `step` is 1-based and counts optimizer steps since the start of
-- training, so a resumed run (a new runs row) continues the numbering of the run it resumed.
CREATE TABLE steps (
  run_id           INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  step             INTEGER NOT NULL CHECK (step >= 1),
  loss             REAL,   -- mean token loss; NULL when it was not finite
  tokens           INTEGER NOT NULL CHECK (tokens >= 0),  -- tokens processed, all ranks and micro-steps
  wall_s           REAL    NOT NULL CHECK (wall_s >= 0),  -- measured step time
  predicted_step_s REAL    CHECK (predicted_step_s IS NULL OR predicted_step_s > 0),  -- the model's
  tokens_per_s     REAL,   -- tokens / wall_s (NULL when wall_s is 0)
  lr               REAL    NOT NULL CHECK (lr >= 0),
  grad_norm        REAL,   -- global L2 norm before clipping; NULL when not computed or not finite
  skipped          INTEGER NOT NULL DEFAULT 0 CHECK (skipped IN (0, 1)),  -- 1: state left untouched
  skip_reason      TEXT,   -- why a skipped step was skipped ("non-finite gradient in unit 3")
  elapsed_s        REAL    NOT NULL,  -- seconds from begin_run to this row's write
  CHECK (skipped = 1 OR skip_reason IS NULL),
  PRIMARY KEY (run_id, step)
);

-- Sampled detailed spans (the executor decides which steps), e.g. for a Chrome trace of a logged run.
-- Times are seconds from the start of the step on the executor's clock.
CREATE TABLE phases (
  run_id           INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  step             INTEGER NOT NULL CHECK (step >= 1),
  rank             INTEGER CHECK (rank IS NULL OR rank >= 0),  -- NULL: host-side work
  category         TEXT    NOT NULL,  -- 'compute' | 'h2d' | 'd2h' | 'fabric' | 'cpu_reduce' | 'cpu_update' ...
  name             TEXT,   -- finer label: 'forward', 'backward', 'recompute', 'all_gather' ...
  unit             INTEGER CHECK (unit IS NULL OR unit >= 0),
  chunk            INTEGER CHECK (chunk IS NULL OR chunk >= 0),
  start_s          REAL    NOT NULL,
  end_s            REAL    NOT NULL,
  -- A multi-node run's node (its ranks are numbered within the node); NULL: a one-node run. Version 2
  -- added it (the last column, as the migration from version 1 appends it).
  node             INTEGER CHECK (node IS NULL OR node >= 0),
  CHECK (end_s >= start_s)
);
CREATE INDEX phases_by_step ON phases (run_id, step);

-- Busy time (and copies' bytes) per step, rank and category: every step's aggregate, so the log
-- stays small while the fidelity tools still see each resource's measured busy time and link bytes.
-- Version 4 added `bytes` (the last column, as the migration from version 3 appends it).
CREATE TABLE phase_totals (
  run_id           INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  step             INTEGER NOT NULL CHECK (step >= 1),
  rank             INTEGER CHECK (rank IS NULL OR rank >= 0),  -- NULL: host-side work
  category         TEXT    NOT NULL,
  busy_s           REAL    NOT NULL CHECK (busy_s >= 0),  -- union of the spans' time (no double count)
  count            INTEGER NOT NULL CHECK (count >= 0),   -- number of spans
  node             INTEGER CHECK (node IS NULL OR node >= 0),  -- as phases.node
  bytes            REAL    CHECK (bytes IS NULL OR bytes >= 0)  -- copies' bytes over the host link; NULL: none
);
-- One row per (step, node, rank, category). A key over `rank` itself would let host rows (NULL)
-- repeat, as SQL treats NULLs as distinct; the expression counts the host as rank -1 (and a one-node
-- run as node 0).
CREATE UNIQUE INDEX phase_totals_unique ON phase_totals (run_id, step, ifnull(node, 0), ifnull(rank, -1), category);

CREATE TABLE errors (
  id               INTEGER PRIMARY KEY,
  run_id           INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  at               TEXT    NOT NULL,
  step             INTEGER CHECK (step IS NULL OR step >= 1),
  rank             INTEGER CHECK (rank IS NULL OR rank >= 0),
  kind             TEXT    NOT NULL,  -- 'input' | 'infeasible' | 'io' | 'numeric' | 'runtime' | ...
  message          TEXT    NOT NULL
);
CREATE INDEX errors_by_run ON errors (run_id);

-- What the model predicted for the run's plan (model/prediction.h), one row per method.
CREATE TABLE predictions (
  id               INTEGER PRIMARY KEY,
  run_id           INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  method           TEXT    NOT NULL,  -- 'analytical' | 'simulator'
  step_time_s      REAL    NOT NULL CHECK (step_time_s > 0),
  tokens_per_s     REAL,
  exposed_s        REAL,
  bottleneck       TEXT    NOT NULL,
  breakdown_json   TEXT    NOT NULL CHECK (json_valid(breakdown_json)),  -- {"compute_s": ..., ...}
  busy_json        TEXT    NOT NULL CHECK (json_valid(busy_json))        -- {"gpu_compute": s, ...}
);
CREATE INDEX predictions_by_run ON predictions (run_id);

-- Evaluations on held-out data (slidedp-run --eval-data): one row per evaluation, after optimizer step
-- `step` (as steps.step), with the weights that step produced; 0: the starting weights (--steps 0).
-- Version 3 added the table.
CREATE TABLE evals (
  run_id           INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  step             INTEGER NOT NULL CHECK (step >= 0),
  loss             REAL,   -- mean token loss over the held-out targets; NULL when not finite
  perplexity       REAL,   -- exp(loss); NULL when not finite
  tokens           INTEGER NOT NULL CHECK (tokens >= 0),  -- targets that counted
  wait_s           REAL    NOT NULL CHECK (wait_s >= 0),  -- the trainer's wait for it after the step
  data             TEXT    NOT NULL,  -- the held-out token file
  PRIMARY KEY (run_id, step)
);

-- The profiler's raw samples: one row per repetition of a measurement.
CREATE TABLE profile_samples (
  id               INTEGER PRIMARY KEY,
  run_id           INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  measurement      TEXT    NOT NULL,  -- 'pcie_h2d_gbps', 'adamw_params_per_s', ...
  params_json      TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(params_json)),
  value            REAL    NOT NULL,
  unit             TEXT    NOT NULL
);
CREATE INDEX profile_samples_by_measurement ON profile_samples (run_id, measurement);

-- ---------------------------------------------------------------------------------------------------
-- Views for readers.

-- Per step, the busy time of each category: the busiest rank's and the mean over the ranks that
-- logged it (host work, rank NULL, is one "rank" of its own category). For copies, the bytes all
-- ranks moved, the most one rank moved, and the rate the copies ran at while busy (all ranks' bytes
-- over all ranks' busy time, GB/s); NULL where no row carries bytes.
CREATE VIEW step_busy AS
SELECT run_id, step, category,
       max(busy_s) AS max_rank_busy_s,
       avg(busy_s) AS mean_rank_busy_s,
       count(*)    AS ranks,
       sum(bytes)  AS bytes,
       max(bytes)  AS max_rank_bytes,
       sum(bytes) / nullif(sum(CASE WHEN bytes IS NULL THEN 0 ELSE busy_s END), 0) / 1e9 AS busy_gbps
FROM phase_totals
GROUP BY run_id, step, category;

-- Steps with the ratios people ask for. exposed_s is the step time not covered by GPU compute on the
-- busiest computing rank (the model's exposed_s is the same quantity); NULL without compute totals.
CREATE VIEW step_view AS
SELECT s.run_id, s.step, s.loss, s.tokens, s.wall_s, s.predicted_step_s,
       s.wall_s / s.predicted_step_s AS measured_over_predicted,
       s.tokens_per_s, s.lr, s.grad_norm, s.skipped, s.skip_reason, s.elapsed_s,
       b.max_rank_busy_s AS compute_busy_s,
       s.wall_s - b.max_rank_busy_s AS exposed_s
FROM steps s
LEFT JOIN step_busy b ON b.run_id = s.run_id AND b.step = s.step AND b.category = 'compute';

-- Steady-state steps: every step but a run's first logged one when it has others (the first includes
-- allocation, first-touch page faults and cold caches).
CREATE VIEW steady_steps AS
SELECT s.*
FROM steps s
JOIN (SELECT run_id, min(step) AS first_step, count(*) AS n FROM steps GROUP BY run_id) f
  ON f.run_id = s.run_id
WHERE s.step > f.first_step OR f.n = 1;

-- Per run and category, the busy time and bytes per step averaged over the run's steady-state steps.
-- A step without totals of a category counts as zero busy time, not as a missing sample; `busy_gbps`
-- is the copies' rate while busy over those steps (NULL without bytes).
CREATE VIEW run_busy AS
SELECT b.run_id, b.category,
       sum(b.max_rank_busy_s) / n.steps  AS max_rank_busy_s,
       sum(b.mean_rank_busy_s) / n.steps AS mean_rank_busy_s,
       n.steps                           AS steps,
       sum(b.bytes) / n.steps            AS bytes,
       sum(b.max_rank_bytes) / n.steps   AS max_rank_bytes,
       sum(b.bytes) / nullif(sum(CASE WHEN b.bytes IS NULL THEN 0 ELSE b.bytes / b.busy_gbps END), 0) AS busy_gbps
FROM step_busy b
JOIN steady_steps s ON s.run_id = b.run_id AND s.step = b.step
JOIN (SELECT run_id, count(*) AS steps FROM steady_steps GROUP BY run_id) n ON n.run_id = b.run_id
GROUP BY b.run_id, b.category;

-- One row per run. `outcome` is 'finished' only for a run that ended normally; 'did not finish'
-- covers failed, interrupted and killed runs, and also a run still in progress (SQL cannot see
-- processes: RunLogReader::run_status checks the pid). Step means are over steady-state steps.
CREATE VIEW run_summary AS
SELECT r.id AS run_id, r.kind, r.parent_run_id, r.status,
       CASE r.status WHEN 'finished' THEN 'finished' ELSE 'did not finish' END AS outcome,
       r.started_at, r.ended_at,
       (julianday(coalesce(r.ended_at, r.last_seen_at)) - julianday(r.started_at)) * 86400.0
         AS duration_s,
       r.host, r.git_revision, r.build_type, r.backend, r.model_name, r.seq_len, r.system,
       r.hardware_name, r.plan_summary,
       (SELECT count(*) FROM steps s WHERE s.run_id = r.id) AS steps,
       (SELECT count(*) FROM steps s WHERE s.run_id = r.id AND s.skipped = 1) AS skipped_steps,
       (SELECT max(step) FROM steps s WHERE s.run_id = r.id) AS last_step,
       (SELECT s.loss FROM steps s WHERE s.run_id = r.id ORDER BY s.step DESC LIMIT 1) AS last_loss,
       (SELECT sum(s.tokens) / sum(s.wall_s) FROM steady_steps s WHERE s.run_id = r.id) AS tokens_per_s,
       (SELECT avg(s.wall_s) FROM steady_steps s WHERE s.run_id = r.id) AS mean_step_s,
       (SELECT avg(s.predicted_step_s) FROM steady_steps s WHERE s.run_id = r.id)
         AS mean_predicted_step_s,
       (SELECT avg(s.wall_s) / avg(s.predicted_step_s) FROM steady_steps s
         WHERE s.run_id = r.id AND s.predicted_step_s IS NOT NULL) AS measured_over_predicted,
       (SELECT count(*) FROM errors e WHERE e.run_id = r.id) AS errors
FROM runs r;

-- Marks the file as a SlideDP run log ('SDPL') and records the schema version; RunLog refuses files
-- with another application id or a version it does not know (runlog/run_log.h).
PRAGMA application_id = 1396985932;
PRAGMA user_version = 5;
