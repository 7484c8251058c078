{{/*
The operator's permissions, split by scope. Keep them in step with what the controller reads (kopf
watches and indexes) and writes (its API client): nothing more. kopf's namespace and CRD scanning is
switched off by the operator, so it needs no access to namespaces or CustomResourceDefinitions.
*/}}

{{/* Cluster-scoped objects, and the API checks every request of the HTTP API makes. */}}
{{- define "heterotrain.clusterRules" -}}
# GPU classes and the nodes that hold them: the scheduler's inventory.
- apiGroups: [heterotrain.io]
  resources: [gpuclasses]
  verbs: [get, list, watch]
# Each class's usable nodes, GPUs, free GPUs and measured speed, as `kubectl get gpuclass` shows them.
- apiGroups: [heterotrain.io]
  resources: [gpuclasses/status]
  verbs: [patch]
# The throughput catalog: one WorkloadProfile per workload key, created when the key is first
# measured; each job's measurement written to its status; read to place and split the next job.
- apiGroups: [heterotrain.io]
  resources: [workloadprofiles]
  verbs: [get, list, watch, create]
- apiGroups: [heterotrain.io]
  resources: [workloadprofiles/status]
  verbs: [patch]
# Queues: quotas and weights the scheduler reads; usage and share written to their status.
- apiGroups: [heterotrain.io]
  resources: [heteroqueues]
  verbs: [get, list, watch]
- apiGroups: [heterotrain.io]
  resources: [heteroqueues/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
# The HTTP API authenticates callers by their token and authorises them per namespace.
- apiGroups: [authentication.k8s.io]
  resources: [tokenreviews]
  verbs: [create]
- apiGroups: [authorization.k8s.io]
  resources: [subjectaccessreviews]
  verbs: [create]
{{- if .Values.kueue.enabled }}
# Kueue's ClusterQueues (quota and its usage per flavor) and ResourceFlavors: what a job's mix may ask for.
- apiGroups: [kueue.x-k8s.io]
  resources: [clusterqueues, resourceflavors]
  verbs: [get, list, watch]
{{- end }}
{{- if not .Values.watchNamespaces }}
# Leader election of a cluster-wide operator.
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}

{{/* Objects in the namespaces the operator serves. */}}
{{- define "heterotrain.namespacedRules" -}}
# The jobs: read, add the finalizer, write status; owner references on what the operator creates need
# update on the finalizers subresource.
- apiGroups: [heterotrain.io]
  resources: [heterotrainjobs]
  verbs: [get, list, watch, patch]
- apiGroups: [heterotrain.io]
  resources: [heterotrainjobs/status]
  verbs: [get, patch]
- apiGroups: [heterotrain.io]
  resources: [heterotrainjobs/finalizers]
  verbs: [update]
# Worker pods, their headless Service, plan ConfigMap and checkpoint volume claim. A deleted job's
# pods go in one request (deletecollection by label).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, deletecollection, patch]
- apiGroups: [""]
  resources: [services, configmaps, persistentvolumeclaims]
  verbs: [get, list, watch, create, delete, patch]
# Events on jobs, shown by kubectl describe (the operator only ever creates them).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.operator.settings.launch.networkPolicy.enabled }}
# Each job's NetworkPolicy (operator.settings.launch.networkPolicy): created with its workers,
# deleted with the job.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, delete, patch]
{{- end }}
{{- if .Values.kueue.enabled }}
# Each job's Kueue Workload: created and deleted with its mix, spec.active set from spec.suspend, and
# its status changed as Kueue's job integrations change it (an eviction handed back, finished,
# pods ready; server-side apply). LocalQueues name a job's ClusterQueue.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, delete, patch]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
- apiGroups: [kueue.x-k8s.io]
  resources: [localqueues]
  verbs: [get, list, watch]
{{- end }}
{{- if .Values.watchNamespaces }}
# Leader election of a namespaced operator: one peering object per served namespace.
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}
