// Package metrics exposes a node's pool and the CSI services to Prometheus
// (github.com/prometheus/client_golang), and serves /metrics, /healthz and /readyz.
//
// # Pool metrics
//
// PoolCollector is a prometheus.Collector over a Source (*pool.Pool). It holds no state and
// costs the I/O path nothing: on each scrape it takes one pool.Status snapshot and, per
// volume, one raid10.Array.Status, whose request and byte counters the engine keeps anyway.
// All names carry the prefix raid10_:
//
//	volume_{read,write}_ops_total{volume}              counter
//	volume_{read,write}_bytes_total{volume}            counter
//	volume_size_bytes{volume}                          gauge
//	volume_health{volume,health}                       state set (Healthy, Degraded, Rebuilding, Failed)
//	volume_members{volume}, volume_members_in_sync     gauge ("4/4" in kubectl)
//	volume_sync_progress_ratio{volume,kind}            gauge 0..1, only while a sync runs
//	volume_sync_rate_bytes_per_second{volume,kind}     gauge
//	volume_sync_remaining_bytes{volume,kind}           gauge
//	volume_sync_eta_seconds{volume,kind}               gauge (0: unknown)
//	volume_member_state{volume,member,state}           state set (in-sync, recovering, faulty, missing)
//	volume_member_io_errors_total{volume,member,disk,op} counter; sum by (disk) for a disk
//	volume_bad_blocks{volume}, volume_lost_blocks       gauge: blocks bad on one copy (summed), on every copy
//	volume_member_bad_blocks{volume,member,disk}       gauge
//	volume_member_timeouts_total{volume,member,disk}   counter: requests past the member deadline
//	volume_limit_{ops,bytes}_per_second{volume,op}     gauge: QoS limit in force (op: read, write); absent when unset
//	volume_limit_burst_{ops,bytes}{volume,op}          gauge: its burst as the engine uses it
//	volume_throttled_requests_total{volume,op}         counter: requests that waited for the limits
//	volume_throttle_wait_seconds_total{volume,op}      counter: the time they waited, summed
//	volume_throttled_bytes_total{volume,op}            counter: the bytes those requests moved
//	disk_info{disk,path,identity}                      always 1
//	disk_state{disk,state}                             state set (Active, Spare, Failed, Removed, Missing, Refused)
//	disk_size_bytes{disk}, disk_free_bytes{disk}       gauge
//	pool_{raw,usable,free_raw,free_usable,largest_volume,spare}_bytes{pool} gauge
//
// kind is the engine's sync kind: recovery (a rebuild), resync, check or repair. disk is the
// pool's disk UUID (the path for a refused disk that has none); disk_info joins it to the
// device path and the serial or WWN. Member error counters are per volume because the
// engine counts per array: a disk's counter summed over volumes would go down when a
// volume is deleted, which Prometheus would read as a counter reset.
//
// # Request metrics
//
// IOCollector is a prometheus.Collector over an IOSource (the node plugin's attacher): the
// NBD server's own request counters of every attached volume, kept per connection under the
// lock that already serialises its replies, so that no cache line is shared between
// connections; a scrape adds them up.
//
//	volume_requests_total{volume,op}                   counter (op: read, write, flush, trim, write_zeroes)
//	volume_request_errors_total{volume,op}             counter
//	volume_request_bytes_total{volume,op}              counter
//	volume_request_duration_seconds{volume,op}         histogram, request read to reply written
//
// # CSI metrics
//
// CSIMetrics counts calls and records their latency by method and gRPC code
// (raid10_csi_operations_total, raid10_csi_operation_duration_seconds). Observe takes the
// method and the error as the client gets it; UnaryServerInterceptor wraps that for
// grpc.ChainUnaryInterceptor.
//
// # HTTP
//
// Handler and Serve serve the metrics of a prometheus.Gatherer on /metrics, liveness on
// /healthz (always ok while serving) and readiness on /readyz (every Check nil; the node
// plugin's checks: the CSI endpoint serves and every attached device has a live server).
package metrics
