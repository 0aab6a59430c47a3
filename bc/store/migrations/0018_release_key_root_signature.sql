-- The command-signing root's own signature of a release key (bc.pki.releases.endorse): made by `bc serve`
-- when it holds the root, else on the operator's machine (`bc release key add --root-key FILE`). Nodes take
-- a new release key from a worker-signed bundle only with it. NULL for a key stored before it existed.
ALTER TABLE release_keys ADD COLUMN root_signature {{BLOB}};
