// The strategy flags on the worker's command line (app/PROTOCOL.md, first paragraph): what a
// launcher writes after `ditstudio-worker --model DIR` (strategyArgs) and what the programs that
// take a strategy parse back with CLI11 (addStrategyOptions: ditstudio-worker, ditstudio-bench,
// ditstudio-cli, ditstudio-server). Both ends of that argv live here so that they name each flag
// once. Part of dit_protocol (app/protocol/): no Torch, no Qt.
#pragma once

#include <string>
#include <vector>

#include "parallel/strategy.h"

namespace CLI {
class App;
}

namespace dit::protocol {

/// Registers the strategy flags on `app`, bound to `s`: --tp-degree, --ring-degree,
/// --ulysses-degree, --ulysses-anything, --ring-anything, --cfg-degree, --dp-degree. Values are
/// not range-checked here: validateDegrees() refuses them with the strategy's own messages.
/// --device is left to each program (the CLI also uses it in-process). Throws
/// CLI::OptionAlreadyAdded when one of the flags is already registered.
void addStrategyOptions(CLI::App& app, Strategy& s);

/// The worker's strategy arguments, in this order: --tp-degree N --ring-degree N
/// --ulysses-degree N [--ulysses-anything] [--ring-anything] --cfg-degree N --dp-degree N
/// --device D (D "cpu" when s.device is empty). Parsed back by addStrategyOptions (+ --device).
std::vector<std::string> strategyArgs(const Strategy& s);

}  // namespace dit::protocol
