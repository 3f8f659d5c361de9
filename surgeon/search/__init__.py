"""Subset searches: plans of head subsets (subsets), the threshold search over them (threshold), a chunk store
that resumes, shards and merges (store), and Ray workers (ray)."""
