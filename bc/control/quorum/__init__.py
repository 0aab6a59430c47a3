"""The quorum: approvers and k, destructive batches, root-equivalent spec changes (docs/quorum.md)."""
