"""Authorization: who may do what where. `visible.py` is the one entrance for memory reads."""
