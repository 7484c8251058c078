"""Trace-driven simulator of a heterogeneous GPU cluster that runs the operator's own scheduler and
planner: compare scheduling policies and plan capacity at scales no test bed reaches."""
