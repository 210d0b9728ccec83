# Sourced by the test scripts that cap a command's address space: vmem_cap KIB (in a subshell, before exec).
# Address-space caps (ulimit -v) cannot apply to ASan-built binaries, which reserve terabytes of shadow memory;
# scripts/test --sanitize sets MESHRUN_SANITIZE=1 and bounds memory with ASan's hard_rss_limit_mb instead.
vmem_cap() { [ -n "${MESHRUN_SANITIZE:-}" ] || ulimit -v "$1"; }
