# Sourced by the shell tests that run the real model: $root (the checkout) and
# $model (Gemma 3 270M, or $DRAY_MODEL), or exit 77 (skip, reported) without it.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="${DRAY_MODEL:-$root/.models/gemma-3-270m-q4_k_m.gguf}"
[ -s "$model" ] || { echo "skip: no model at $model (run ci/setup.sh)"; exit 77; }

# need_mpi BUILD_DIR: skip without mpirun or the MPI transport module, then let
# mpirun run as root (CI does) and put 2-3 ranks on 2 cores.
need_mpi() {
  command -v mpirun >/dev/null || { echo "skip: no mpirun (run ci/setup.sh)"; exit 77; }
  [ -e "$1/transports/libdray-mpi.so" ] ||
    { echo "skip: no $1/transports/libdray-mpi.so (Open MPI missing at build)"; exit 77; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
}

# ids OUTPUT: the last line of token ids that `dray run --print-token-ids` printed.
ids() { grep -E '^[0-9]+( [0-9]+)+$' <<<"$1" | tail -n 1; }
