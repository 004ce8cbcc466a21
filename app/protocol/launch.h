// Compatibility header: the mpirun argv builder, strategy flags and mpirun-failure parsing moved
// to dit_launcher (app/launcher/launch.h, namespace dit::launcher). This path and the
// dit::protocol names stay for the callers not yet moved (app/bench_main.cpp, the existing tests);
// new code includes app/launcher/launch.h. Linking needs dit_launcher.
#pragma once

#include "app/launcher/launch.h"

namespace dit::protocol {
using launcher::addStrategyOptions;
using launcher::availableCores;
using launcher::defaultMpirun;
using launcher::forwardedEnvironment;
using launcher::HostfileEntry;
using launcher::isolationProgram;
using launcher::mpirunArgv;
using launcher::MpirunLaunch;
using launcher::networkMcaParams;
using launcher::parseHostfile;
using launcher::parseMpirunFailure;
using launcher::planHostfile;
using launcher::RankFailure;
using launcher::shellQuoted;
using launcher::strategyArgs;
using launcher::threadPlacementArgs;
}  // namespace dit::protocol
