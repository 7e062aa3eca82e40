# mpi_sanitized.sh - sourced by the tests that start mpirun. Under the sanitized build
# (STRATA_TEST_SANITIZED) OpenMPI does not free all it allocates at MPI_Init/MPI_Finalize:
# its libraries' leaks are suppressed (strata's are still found), with its components kept
# loaded and a full unwind (its libraries have no frame pointers) so that each leak is
# attributed. Elsewhere it does nothing.
if [ -n "${STRATA_TEST_SANITIZED:-}" ]; then
  export LSAN_OPTIONS="suppressions=$(dirname "$0")/lsan_mpi.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
  export OMPI_MCA_mca_component_disable_dlclose=1 PMIX_MCA_mca_component_disable_dlclose=1
fi
