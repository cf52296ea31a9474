module github.com/raid10-csi/raid10-csi

go 1.26

require k8s.io/klog/v2 v2.140.0

require github.com/go-logr/logr v1.4.1 // indirect
