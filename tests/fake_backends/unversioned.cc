// A backend library built before the interface carried a version: it exports the old
// factory only. Core must never call it (its C++ signature is not this build's).
#include <cstdlib>

extern "C" void* qlink_backend_v1(const void*, void*) { std::abort(); }
