# bench_comm: point-to-point and all-reduce bandwidth through the MPI Communicator vs a plain MPI loop, in one run
# (mpirun -np 2). Built when runtime/ found MPI; its own find_package because imported targets are per folder.
if(TARGET apart_runtime AND APART_HAVE_MPI)
  find_package(MPI COMPONENTS C REQUIRED)
  add_executable(bench_comm ${CMAKE_CURRENT_LIST_DIR}/comm_bench.cpp)
  target_link_libraries(bench_comm PRIVATE apart_runtime MPI::MPI_C)
  target_compile_definitions(bench_comm PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
endif()
