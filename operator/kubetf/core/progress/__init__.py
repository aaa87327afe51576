"""Training progress in the TrainingJob's status, pure: one module per concern.

- `protocol`: what a training pod sends (``POST /v1/progress``, protocol v1) and how a body is read;
- `identity`: who may report (the pod a projected token is bound to, owned by the job) and whose reports count;
- `merge`: a report folded into ``status.progress`` (position, metrics, history, percent, summary);
- `rates`: steps and examples per second, seconds per epoch, the ETA and how a duration is written;
- `health`: the TrainingUnhealthy condition of a running job (a diverged loss, a stall);
- `curve`: the terminal chart `kubetf status` draws of the history.

The operator's side of the wire (the HTTP server, token reviews, the reports held until written) is in
`kubetf.runtime.progress`.
"""
