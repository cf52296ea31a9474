#!/bin/sh
# One of the node's waiting connections on the API server's way to its kubelet (tunnel.go):
# dials the host's tunnel at guestfwd address $1, waits for the host's one byte, joins the
# connection to the kubelet's port $2 on this node, then dials again; ends once file $3
# exists. node.sh runs several.
#
# The kubelet's address reaches the inner socat through the environment: socat splits the
# SYSTEM command of its own address at every colon, so a literal TCP:127.0.0.1:10250 there
# arrived as "TCP" alone (wrong number of parameters) and every joined connection closed at
# once (`kubectl logs` answered EOF on the rig; issue 25).
set -u
tunnel=$1 port=$2 stop=$3
export KUBELET_ADDR="TCP:127.0.0.1:$port"
while [ ! -e "$stop" ]; do
	# shellcheck disable=SC2016 # expanded by socat's shell, not here
	socat "TCP:$tunnel" \
		SYSTEM:'dd bs=1 count=1 of=/dev/null 2>/dev/null && exec socat - "$KUBELET_ADDR"' \
		2>/dev/null || sleep 1
done
