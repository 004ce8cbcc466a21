#!/usr/bin/env bash
# Proves that tests/layering_check.sh can fail: on a small tree that follows every rule it passes;
# each planted violation (a class-name literal outside the family folders, an include from
# parallel/ or backend/ into app/ or ui/, an include from backend/io/ into backend/models/, a family
# folder including a family table, shared backend code including a family's folder, a rank in
# app/worker/ or app/bench/ including app/launcher/) makes it fail naming the offending line.
# Usage: layering_selftest.sh CHECK_SCRIPT
set -uo pipefail
CHECK=${1:?layering_check.sh}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mk() { mkdir -p "$(dirname "$T/$1")"; printf '%s\n' "$2" > "$T/$1"; }
mk parallel/strategy.cpp '#include "parallel/strategy.h"'
mk ui/main_window.cpp '#include "ui/main_window.h"'
mk app/cli/cli_main.cpp '// a comment may name "FluxPipeline"'
mk backend/io/model_folder.cpp '#include "backend/io/config_json.h"'
mk backend/models/flux/flux_family.cpp 'const char* k = "FluxPipeline";'
mk backend/pipelines/flux/pipeline_flux.cpp 'const char* k = "FluxTransformer2DModel";'
mk backend/pipelines/flux/flux_pipeline_config.cpp '#include "backend/models/flux/flux_plan.h"'
mk backend/models/flux/flux_runtime.h '#include "backend/family_runtime_record.h"'
mk backend/models/family_registry.cpp '#include "backend/models/flux/flux_family.h"'
mk backend/family_runtime.cpp '#include "backend/models/flux/flux_runtime.h"'
mk app/worker/worker_main.cpp '#include "app/protocol/port_probe.h"'
mk app/bench/bench_main.cpp '#include "app/protocol/strategy_args.h"'
mk app/cli/cli_mpi.cpp '#include "app/launcher/group_start.h"'
fail=0
if ! out=$(bash "$CHECK" "$T" 2>&1); then
  echo "a clean tree was refused:"; echo "$out"; fail=1
fi
expect_refusal() {  # FILE LINE WHAT
  local f=$1 line=$2 what=$3 saved=""
  [ -e "$T/$f" ] && saved=$(cat "$T/$f")
  mk "$f" "$line"
  if out=$(bash "$CHECK" "$T" 2>&1); then
    echo "not refused: $what"; fail=1
  elif ! grep -q "$f" <<< "$out"; then
    echo "refused without naming $f ($what):"; echo "$out"; fail=1
  fi
  if [ -n "$saved" ]; then printf '%s\n' "$saved" > "$T/$f"; else rm -f "$T/$f"; fi
}
expect_refusal app/bench/bench_main.cpp 'if (cls == "Flux2KleinPipeline") {}' "pipeline class literal in app/"
expect_refusal ui/model_info.cpp 'auto c = "QwenImageTransformer2DModel";' "transformer class literal in ui/"
expect_refusal backend/models/memory_estimate.cpp 'bool f = p == "FluxPipeline";' "class literal in backend/models/ outside a family folder"
expect_refusal parallel/runtime.cpp '#include "app/protocol/protocol.h"' "parallel/ including app/"
expect_refusal backend/nn/x.cpp '#include "ui/theme.h"' "backend/ including ui/"
expect_refusal app/cli/cli_main.cpp 'opts.add_option("--cfg-truncation", v);' "a family knob's flag in app/"
expect_refusal ui/generation_panel.cpp 'p.options["cfg_normalization"] = 1;' "a family knob's name in ui/"
expect_refusal backend/pipelines/flow_match_pipeline.cpp 'if (cfg.is_distilled) {}' "a family rule in the shared loop"
expect_refusal backend/pipelines/flow_match_pipeline.cpp '#include "backend/models/family_registry.h"' "the shared loop including the family table"
expect_refusal app/server/routes_images.cpp 'if (auto v = number(b, "true_cfg_scale")) {}' "FluxPipeline's true CFG scale read by a front end"
expect_refusal backend/models/flux/flux_runtime.cpp '#include "backend/models/family_registry.h"' "a family including the family table"
expect_refusal backend/pipelines/flux/flux_pipeline_config.cpp '#include "backend/models/family_registry.h"' "a family's pipeline folder including the family table"
expect_refusal backend/models/flux/flux_runtime.h '#include "backend/family_runtime.h"' "a family's runtime including the Torch family table"
expect_refusal backend/models/checkpoint_layouts.h '#include "backend/models/flux/flux_config.h"' "shared models code including a family's header"
expect_refusal backend/pipelines/guider.cpp '#include "backend/pipelines/flux/pipeline_flux.h"' "the shared loop including a family's pipeline"
expect_refusal backend/models/dual_stream_runtime.h '#include "backend/family_runtime.h"' "a shared runtime helper including the Torch family table"
expect_refusal backend/nn/attention.cpp '#include "backend/models/cache/step_cache.h"' "the shared layers including a model's step cache"
expect_refusal app/worker/worker.cpp '#include "app/launcher/launch.h"' "a rank (the worker) including the launcher"
expect_refusal app/bench/bench_main.cpp '#include "app/launcher/fingerprint.h"' "a rank (the bench) including the launcher"
expect_refusal backend/io/checkpoint_layouts.h '#include "backend/models/flux/flux_config.h"' "backend/io/ including backend/models/"
[ $fail -eq 0 ] && echo "layering self-test: the check passes a clean tree and refuses each planted violation"
exit $fail
