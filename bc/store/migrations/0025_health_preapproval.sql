-- A health policy's pre-approvals (docs/health.md): the one-leaf `health.preapprove` batch the approvers sign
-- over a version ('' when the version names no pre-approval, or no approvers exist to sign it).
ALTER TABLE health_policies ADD COLUMN preapproval_batch TEXT NOT NULL DEFAULT '';

-- The health policy version whose signed pre-approval the gateway sends with a command (0: none): the
-- node checks it itself (agent/quorum.py) instead of a batch of the command's own.
ALTER TABLE commands ADD COLUMN preapproval INTEGER NOT NULL DEFAULT 0;
