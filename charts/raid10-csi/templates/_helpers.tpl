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

{{/* The node pool's configuration (pkg/pool.Config as JSON). */}}
{{- define "raid10-csi.poolConfig" -}}
{{- $p := .Values.node.pool -}}
{{- $disks := list -}}
{{- range $p.disks -}}
{{- $d := dict "path" .path -}}
{{- if .wipe }}{{ $_ := set $d "wipe" true }}{{ end -}}
{{- if .spare }}{{ $_ := set $d "spare" true }}{{ end -}}
{{- $disks = append $disks $d -}}
{{- end -}}
{{- $c := dict "name" $p.name "disks" $disks "allocation" $p.allocation -}}
{{- if $p.rebuildRateMax }}{{ $_ := set $c "rebuildRateMax" (int64 $p.rebuildRateMax) }}{{ end -}}
{{- with $p.scrub }}{{ $_ := set $c "scrub" . }}{{ end -}}
{{- toPrettyJson $c -}}
{{- end -}}
