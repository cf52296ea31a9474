{{/* Common names and labels. */}}
{{- define "raid10-csi.name" -}}raid10-csi{{- end -}}

{{- define "raid10-csi.labels" -}}
app.kubernetes.io/name: {{ include "raid10-csi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "raid10-csi.selector" -}}
app.kubernetes.io/name: {{ include "raid10-csi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "raid10-csi.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The kubelet's plugin directory for this driver. */}}
{{- define "raid10-csi.pluginDir" -}}
{{ .Values.node.kubeletDir }}/plugins/raid10.csi.io
{{- end -}}

{{/* The container securityContext of every unprivileged container. */}}
{{- define "raid10-csi.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}
