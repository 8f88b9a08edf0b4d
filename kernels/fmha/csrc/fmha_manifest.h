// The doctor's launch manifest record (docs/doctor-and-wheelhouse.md): a compile unit that launches
// a kernel with dynamic shared memory declares the bytes in a file-static __device__ array named
// kforge_launch_smem, so `kforge doctor` can prove from the binary that the kernel launches on
// every arch of the build (sm_120's 99 KiB per block included).
#pragma once

struct KforgeLaunchSmem {
  char kernel[96];       // a substring of the kernel's mangled name
  unsigned int bytes;    // dynamic shared memory per block
};
