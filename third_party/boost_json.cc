// Boost.JSON's compiled part, built once: Debian ships Boost 1.81 as headers only.
#include <boost/json/src.hpp>
