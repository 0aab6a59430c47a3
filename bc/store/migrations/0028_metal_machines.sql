-- Bare-metal machines (docs/metal.md, "Provisioning as jobs"): what `bc metal enroll` registered, behind which
-- site node, and where its provisioning stands. The BMC address, system id and MACs are also in the site
-- node's `site` section (`machines[]`, a signed generation): the section is what the site obeys, this row is
-- what `bc metal list` shows and what a provisioning job reads. `state` is enrolled | provisioning |
-- provisioned | failed, with `step` the step it is at (or failed at) and `reason` a failure's words.
CREATE TABLE metal_machines (
  name TEXT PRIMARY KEY,
  site_node TEXT NOT NULL,
  bmc_url TEXT NOT NULL,
  system_id TEXT NOT NULL DEFAULT '',
  macs TEXT NOT NULL DEFAULT '[]',
  labels TEXT NOT NULL DEFAULT '{}',
  state TEXT NOT NULL DEFAULT 'enrolled' CHECK (state IN ('enrolled', 'provisioning', 'provisioned', 'failed')),
  step TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  node_id TEXT NOT NULL DEFAULT '',
  dag_id TEXT NOT NULL DEFAULT '',
  enrolled_by TEXT NOT NULL DEFAULT '',
  created_at_ms BIGINT NOT NULL,
  updated_at_ms BIGINT NOT NULL
);
CREATE INDEX metal_machines_by_site ON metal_machines (site_node, name);
