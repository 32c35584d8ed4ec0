// <immintrin.h> for the files that use AVX-512 intrinsics: include this instead of it.
// GCC 12's AVX-512 headers initialise _mm512_undefined_* from themselves (GCC bug 105593),
// and its -W(maybe-)uninitialized warnings on them are false; the pragma has to come before
// the first inclusion of the header (the standard headers do not include it), so it lives here.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
