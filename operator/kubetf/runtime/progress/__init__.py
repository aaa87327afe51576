"""The progress endpoint: training pods POST their reports (kubetf.core.progress.protocol); the leader holds each
job's freshest progress and the job's own status write carries it (kubetf.core.reconcile).

One module per concern, as in front of any server the operator runs:
- `server`: the transport, a bounded HTTP/1.1 server (connections, header and body limits, deadlines) that refuses
  before it reads and hands each request to `endpoint` in two steps: the head, then the body;
- `auth`: who the token belongs to: its claims read at no cost, then a TokenReview on the endpoint's own client and
  budget, cached;
- `endpoint`: what a report must be to be taken: the leader's, from a pod owned by the job (by uid), well-formed;
- `book`: the reports held per job until its status write carries them, and when those writes are due (a budget);
- `gauges`: each job's Prometheus series, bounded, removed with the job.
"""
