-- The command-signing root's own signature of a quorum change's step (docs/quorum.md): made by `bc serve`
-- when it holds the root, else on the operator's machine (`bc approvers … --root-key FILE`). NULL for a
-- change stored before it existed.
ALTER TABLE quorum_changes ADD COLUMN root_signature {{BLOB}};
