"""What every algorithm module shares: flags, the objective, the run, checkpoints, MPI tags
(see algorithms/__init__.py)."""
