{{/* Chart name, truncated to fit a DNS label with the suffixes added below. */}}
{{- define "kubetf.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/* Release full name: the release name when it already contains the chart name, else release-chart. */}}
{{- define "kubetf.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the operator's Deployment, (Cluster)Role and bindings. */}}
{{- define "kubetf.operatorName" -}}
{{- printf "%s-operator" (include "kubetf.fullname" .) }}
{{- end }}

{{- define "kubetf.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubetf.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubetf.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "kubetf.labels" -}}
helm.sh/chart: {{ include "kubetf.chart" . }}
{{ include "kubetf.selectorLabels" . }}
app.kubernetes.io/part-of: kubetf
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kubetf.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubetf.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kubetf.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The rules the operator needs on the objects it manages, in every namespace it watches. Nothing else: no
secrets, no configmaps, no pods/exec, no wildcards (a unit test keeps it so).
*/}}
{{- define "kubetf.operatorRules" -}}
# TrainingJobs: watched by kopf; read before each reconcile; deleted after ttlSecondsAfterFinished.
- apiGroups: [kubetf.io]
  resources: [trainingjobs]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [kubetf.io]
  resources: [trainingjobs/status]
  verbs: [get, patch, update]
# Children carry ownerReferences with blockOwnerDeletion, which needs update on the owner's finalizers.
- apiGroups: [kubetf.io]
  resources: [trainingjobs/finalizers]
  verbs: [update]
# patch: pods created under Kueue's pod integration (before the operator made Workloads: docs/kueue.md): its
# finalizer leaves such a pod once it is deleted and runs nothing.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
# The log of a pod sent SIGTERM, from then on: TensorFlow's "SIGTERM caught at" line says the program ignores it,
# so the rest of the group is stopped at once instead of training on for its grace period (kubetf/sigterm.py).
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
- apiGroups: [""]
  resources: [services, persistentvolumeclaims]
  verbs: [get, list, create]
# Kueue's job framework (kubetf/core/kueue.py): a queued job's Workload made, watched (admitted, evicted: at once,
# not at a poll) and written (its spec while it holds no quota, its activation, PodsReady, the quota given back
# after an eviction, Finished, its finalizer); LocalQueues watched, one the watch has not shown read; a queue's
# pending Workloads for a job's position. Never deleted: the garbage collector takes it with its job.
- apiGroups: [kueue.x-k8s.io]
  resources: [localqueues]
  verbs: [get, list, watch]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, patch]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
- apiGroups: [visibility.kueue.x-k8s.io]
  resources: [localqueues/pendingworkloads]
  verbs: [get]
# Gang scheduling without Kueue (docs/gang-scheduling.md): a job's PodGroups, made before its pods, watched for what
# the scheduler says, an older generation's deleted once no pod uses it; Kubernetes' own also needs the job's
# Workload, made once, watched (whose it is, before a pod joins it) and never deleted: the garbage collector takes it
# with the job.
- apiGroups: [scheduling.k8s.io, scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [get, list, watch, create, delete]
- apiGroups: [scheduling.k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create]
# Events on TrainingJobs, the operator's own (kopf posts none: it would write outside the leader lease).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{/*
What kopf needs cluster-wide for itself: it watches CustomResourceDefinitions to notice the TrainingJob CRD
(re)appearing, and with explicit namespaces it watches Namespace objects to notice them being created.
*/}}
{{- define "kubetf.kopfRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- end }}

{{/*
Kueue's visibility API for a whole ClusterQueue (cluster-scoped): one read per ClusterQueue, instead of one per
LocalQueue, tells every queued job its place. Only for an operator that serves every namespace.
*/}}
{{- define "kubetf.clusterQueueRules" -}}
- apiGroups: [visibility.kueue.x-k8s.io]
  resources: [clusterqueues/pendingworkloads]
  verbs: [get]
{{- end }}

{{/*
Cluster-scoped objects a job's Workload needs, read one at a time: its priority (the WorkloadPriorityClass of the
label kueue.x-k8s.io/priority-class, else the PriorityClass of spec.priorityClassName) when it is made, and the
ResourceFlavors its admission assigned (their node labels and tolerations go on its pods).
*/}}
{{- define "kubetf.kueueClassRules" -}}
- apiGroups: [kueue.x-k8s.io]
  resources: [workloadpriorityclasses, resourceflavors]
  verbs: [get]
- apiGroups: [scheduling.k8s.io]
  resources: [priorityclasses]
  verbs: [get]
{{- end }}

{{/*
Nodes are cluster-scoped: read one at a time, only to tell whether a pod being deleted there can still be confirmed
by its kubelet (a lost node: the pod is force-deleted, see runPolicy.forceDeleteOnNodeLoss). No list, no watch.
*/}}
{{- define "kubetf.nodeRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
{{- if .Values.progress.enabled }}
# The progress endpoint checks each training pod's token (TokenReview): which pod sent the report.
- apiGroups: [authentication.k8s.io]
  resources: [tokenreviews]
  verbs: [create]
{{- end }}
{{- end }}
