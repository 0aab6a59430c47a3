-- The health reconciler (docs/health.md): its policy's versions, its episodes, and GPU-level cordons.
-- Each `bc health policy set` is a new version with who set it and when; the newest is in force.
CREATE TABLE health_policies (
  version INTEGER PRIMARY KEY,
  policy TEXT NOT NULL,
  set_by TEXT NOT NULL DEFAULT '',
  set_at_ms BIGINT NOT NULL,
  reason TEXT NOT NULL DEFAULT ''
);

-- One row per episode: a GPU's stretch of being sick, from the condition the policy acts on to the GPU
-- returned, quarantined or cleared (bc.control.health.decide). At most one open (queued, running) per GPU.
CREATE TABLE health_episodes (
  id TEXT PRIMARY KEY,
  node_id TEXT NOT NULL,
  gpu_uuid TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'quarantined', 'cleared')),
  action TEXT NOT NULL,
  rule TEXT NOT NULL DEFAULT '',
  stage TEXT NOT NULL DEFAULT '',
  evidence TEXT NOT NULL DEFAULT '{}',
  dag_id TEXT,
  wait_reason TEXT NOT NULL DEFAULT '',
  outcome TEXT NOT NULL DEFAULT '',
  policy_version INTEGER NOT NULL DEFAULT 0,
  opened_at_ms BIGINT NOT NULL,
  started_at_ms BIGINT,
  ended_at_ms BIGINT,
  clear_since_ms BIGINT
);
CREATE UNIQUE INDEX health_episodes_open ON health_episodes (node_id, gpu_uuid) WHERE state IN ('queued', 'running');
CREATE INDEX health_episodes_ended ON health_episodes (ended_at_ms);

-- When the reconciler took each automatic action (a remediation started, a reboot after a failed reset):
-- the hourly limit counts these.
CREATE TABLE health_actions (
  episode_id TEXT NOT NULL,
  stage TEXT NOT NULL,
  at_ms BIGINT NOT NULL,
  PRIMARY KEY (episode_id, stage)
);
CREATE INDEX health_actions_at ON health_actions (at_ms);

-- A GPU taken out of placement (node cordons are nodes.cordoned): by a remediation for its run, or
-- quarantined for a person. Placement offers no atom of a cordoned GPU; a hold already on it stays (I5).
CREATE TABLE gpu_cordons (
  node_id TEXT NOT NULL,
  gpu_uuid TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  episode_id TEXT,
  quarantined INTEGER NOT NULL DEFAULT 0,
  cordoned_by TEXT NOT NULL DEFAULT '',
  since_ms BIGINT NOT NULL,
  PRIMARY KEY (node_id, gpu_uuid)
);
