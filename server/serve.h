// `morserve serve`: the gRPC server over one engine, with Prometheus metrics.
#pragma once

#include "engine/tools/commands.h"

namespace morserve {

int ServeCommand(const Args& args);  // morserve serve --model DIR [--port P] ...

}  // namespace morserve
