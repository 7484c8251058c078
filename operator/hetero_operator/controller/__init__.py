"""The scheduling loop and what it is made of.

Pure: `inventory` (the watches as one immutable view and the scheduler's snapshot), `lifecycle` (a
job's next status from its pods), `transitions` and `decision_effects` (what the cycle's own and the
scheduler's decisions do to a job), `cycle_plan` (one cycle: view in, `CyclePlan` of writes out),
`launcher` and `events` (the objects a job owns), `job_conditions`. Beside them: `status_cache`
(assumed statuses) and `expectations` (what was set in motion), both on an injected `clock`;
`writers` (each job's writes in order); `scheduling_loop` (the thin loop); `k8s` (the API client).
kopf's handlers and the wiring live in `hetero_operator.manager`.
"""
