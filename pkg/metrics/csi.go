package metrics

import (
	"context"
	"path"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// CSIMetrics counts CSI calls and their latency by method and gRPC code:
//
//	raid10_csi_operations_total{method="CreateVolume",code="OK"}
//	raid10_csi_operation_duration_seconds{method="CreateVolume",code="OK"} (histogram)
//
// method is the last element of the gRPC full method name.
type CSIMetrics struct {
	ops      *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// csiBuckets span a fast identity call (1 ms) to a CreateVolume that waits for the node
// agent or an mkfs of a large volume (minutes).
var csiBuckets = []float64{.001, .005, .025, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// NewCSIMetrics registers the CSI metrics with reg.
func NewCSIMetrics(reg prometheus.Registerer) (*CSIMetrics, error) {
	m := &CSIMetrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "csi", Name: "operations_total",
			Help: "CSI calls handled, by method and gRPC status code.",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: "csi", Name: "operation_duration_seconds",
			Help:    "Latency of CSI calls, by method and gRPC status code.",
			Buckets: csiBuckets,
		}, []string{"method", "code"}),
	}
	for _, c := range []prometheus.Collector{m.ops, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Observe records one call. fullMethod may be the gRPC full method name
// (/csi.v1.Controller/CreateVolume) or the bare method name; err is the call's error as
// returned to the client (nil, or a gRPC status error; anything else counts as Unknown).
func (m *CSIMetrics) Observe(fullMethod string, err error, d time.Duration) {
	method := path.Base(fullMethod)
	code := codes.OK
	if err != nil {
		code = status.Code(err)
	}
	m.ops.WithLabelValues(method, code.String()).Inc()
	m.duration.WithLabelValues(method, code.String()).Observe(d.Seconds())
}

// UnaryServerInterceptor returns an interceptor that observes every call. Chain it outside
// the interceptor that maps errors to gRPC codes, so that it sees the codes the client gets:
//
//	grpc.ChainUnaryInterceptor(m.UnaryServerInterceptor(), logAndMap)
func (m *CSIMetrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		m.Observe(info.FullMethod, err, time.Since(start))
		return resp, err
	}
}
