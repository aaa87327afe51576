"""Talking to the Kubernetes API: the client adapter (`kube.Kube`, behind the `KubeApi` protocol), the cache the
watches fill, the Lease election, the work queue, the metrics. May use kubetf.core, never the running operator or the
command line, never kopf."""
