// <immintrin.h> for the CPU kernels that use x86 intrinsics. GCC 12's AVX-512
// headers trip its own -Wuninitialized on _mm512_undefined_* (GCC bug 105593);
// the diagnostics point into the header, so they are silenced around it alone.
// Include only where the target is x86.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
