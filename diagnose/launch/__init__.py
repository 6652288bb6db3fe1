"""Relaunching a job and following it: the launcher interface (local, Slurm), the follow mode, the relaunch loop."""
