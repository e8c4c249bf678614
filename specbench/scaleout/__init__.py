"""Scale-out: processes on any number of machines sharing one run or tune through an Optuna storage.

- storage: open a storage (heartbeats for RDB ones), create, check or drop a study;
- claims: the rule that gives each point to exactly one trial;
- liveness: heartbeats, and giving back the points of workers that died or were interrupted;
- workers: the launcher of local worker processes.
"""
