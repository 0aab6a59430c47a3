-- Shell typescripts (docs/access.md, "Typescripts"): whether a tunnel's ticket carries the promise to record
-- (`rec`), and the typescript the operator's own `bc shell` uploads, in bounded chunks in order. The policy
-- (off | optional | required) is a row of `settings` (`tunnels.record_policy`).
ALTER TABLE tunnel_sessions ADD COLUMN record_promised INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tunnel_sessions ADD COLUMN typescript_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tunnel_sessions ADD COLUMN typescript_done INTEGER NOT NULL DEFAULT 0;

CREATE TABLE tunnel_typescripts (
  sid TEXT NOT NULL,
  seq INTEGER NOT NULL,
  data {{BLOB}} NOT NULL,
  PRIMARY KEY (sid, seq)
);
