package driver

import (
	"context"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"k8s.io/klog/v2"
)

// logAndMap is the one gRPC boundary of the services: it maps the error a handler returns to
// its gRPC status (codeOf) and logs every failed call with klog; at -v=4 it also logs each
// request, with its secrets stripped, and each success.
func logAndMap(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	logger := klog.FromContext(ctx).WithValues("method", info.FullMethod)
	if id := volumeIDOf(req); id != "" {
		logger = logger.WithValues("volumeID", id)
	}
	if v := logger.V(4); v.Enabled() {
		if m, ok := req.(proto.Message); ok {
			v.Info("CSI request", "request", stripSecrets(m))
		}
	}
	resp, err := handler(klog.NewContext(ctx, logger), req)
	if err != nil {
		st := toStatus(err)
		logger.Error(err, "CSI call failed", "code", status.Code(st).String(), "duration", time.Since(start))
		return nil, st
	}
	logger.V(4).Info("CSI call succeeded", "duration", time.Since(start))
	return resp, nil
}

// volumeIDOf returns the volume a request is about: its volume_id, or the name of a
// CreateVolume.
func volumeIDOf(req any) string {
	switch r := req.(type) {
	case interface{ GetVolumeId() string }:
		return r.GetVolumeId()
	case *csi.CreateVolumeRequest:
		return r.GetName()
	}
	return ""
}

// stripSecrets returns a copy of m without the fields the CSI spec marks csi_secret, at any
// depth, for logging.
func stripSecrets(m proto.Message) proto.Message {
	c := proto.Clone(m)
	strip(c.ProtoReflect())
	return c
}

func strip(m protoreflect.Message) {
	var secret []protoreflect.FieldDescriptor
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if isSecret(fd) {
			secret = append(secret, fd)
			return true
		}
		if fd.Message() == nil {
			return true
		}
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				strip(l.Get(i).Message())
			}
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					strip(mv.Message())
					return true
				})
			}
		default:
			strip(v.Message())
		}
		return true
	})
	for _, fd := range secret {
		m.Clear(fd)
	}
}

func isSecret(fd protoreflect.FieldDescriptor) bool {
	opts := fd.Options()
	if opts == nil {
		return false
	}
	v, ok := proto.GetExtension(opts, csi.E_CsiSecret).(bool)
	return ok && v
}
