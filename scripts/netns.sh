#!/usr/bin/env bash
# Runs a command in a network namespace of its own whose only interface is loopback:
#
#   scripts/netns.sh CMD [ARG...]
#
# scripts/test.sh and scripts/long-test.sh run their suites (after the installs, which need the
# package registries) through it, so that a test, a server it starts or a library it calls
# (an SDK looking for instance metadata, a resolver) can reach only this machine: a connection
# to any address other than 127.0.0.0/8 or ::1 fails at once with "network unreachable",
# nothing leaves the machine. The namespace's loopback is new and empty: servers must be
# started inside it (the scripts do).
#
# Needs root (unshare -n) or unprivileged user namespaces (unshare -rn, the command then runs
# as root of its user namespace). Where neither works it says so on stderr, and runs the
# command as it is, unless BLOBSNAP_REQUIRE_NETNS=1 (scripts/test.sh and long-test.sh set it
# on every run), which makes that an error.
# Inside, BLOBSNAP_NETNS=loopback-only: tests/it/loopback_only.rs then checks that the
# process sees no interface but lo. tests/it/loopback_only.rs also checks, everywhere, that no
# test, bench or script names an address off this machine.
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: $0 CMD [ARG...]" >&2
  exit 2
fi
# Already inside a loopback-only namespace (a nested call): the interfaces say so, not an
# inherited variable, which alone never skips the guard.
only_lo() { [ "$(ls /sys/class/net 2>/dev/null | tr '\n' ' ')" = "lo " ]; }
if [ "${BLOBSNAP_NETNS:-}" = loopback-only ] && only_lo; then
  exec "$@"
fi

inner='ip link set lo up && export BLOBSNAP_NETNS=loopback-only && exec "$@"'
if unshare -n true 2>/dev/null; then
  echo "netns.sh: running in a network namespace with loopback only (unshare -n): $*" >&2
  exec unshare -n -- bash -c "$inner" netns "$@"
elif unshare -rn true 2>/dev/null; then
  echo "netns.sh: running in a user + network namespace with loopback only (unshare -rn): $*" >&2
  exec unshare -rn -- bash -c "$inner" netns "$@"
elif [ "${BLOBSNAP_REQUIRE_NETNS:-}" = 1 ]; then
  echo "netns.sh: cannot create a network namespace (unshare -n needs root, unshare -rn user namespaces) and BLOBSNAP_REQUIRE_NETNS=1" >&2
  exit 1
else
  echo "netns.sh: WARNING: cannot create a network namespace (unshare -n needs root, unshare -rn user namespaces): running WITHOUT the loopback-only guard; only tests/it/loopback_only.rs's source check applies" >&2
  exec "$@"
fi
