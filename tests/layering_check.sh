#!/usr/bin/env bash
# Layering rules that linking alone does not show (ARCHITECTURE.md):
#  1. parallel/ holds no model knowledge: no FLUX layer, block or class name anywhere in it (code or
#     comments), so a model's plan is the only place its layers are named.
#  2. parallel/ never includes backend/ or ui/; ui/ never includes Torch, c10 or MPI headers.
#  3. Nothing in parallel/ or backend/ includes app/ or ui/ (the programs and front ends sit on top),
#     and parallel/ links no app/ library (its event lines come from the formatter the worker's
#     main installs); app/launcher/ (dit_launcher) and app/server/ (dit_server) include no Torch,
#     Qt or MPI header (nor backend/, for the server).
#  4. backend/io/ never includes backend/models/ or backend/pipelines/ (io reads files; families
#     live above it).
#  5. No pipeline or transformer class name as a string literal outside the family folders
#     (backend/models/<f>/ holding a <f>_family.cpp, and backend/pipelines/<f>/): every other
#     place asks the family record (backend/models/family.h). Tests are exempt.
#  6. No family-specific request rule outside the family folders: the names of a family's own
#     request fields and flags (true_cfg_scale, cfg_truncation, cfg_normalization, is_distilled;
#     their --flag spellings) and the retired
#     per-front-end CFG rules (cfg_from_guidance, runsCfg, OptionMeanings, cfgPolicy) appear in
#     code (comments aside) only in backend/models/<f>/ and backend/pipelines/<f>/: every front
#     end reads the family's declared request (backend/models/request_spec.h). Tests exempt.
#  7. A family's folders (backend/models/<f>/ and backend/pipelines/<f>/) never include either
#     family table (backend/models/family_registry.h, backend/family_runtime.h): the tables
#     include the families, not the reverse. A family's Torch half includes its record type
#     (backend/family_runtime_record.h); a family's pipeline config computes its dims itself.
#  8. Nothing else in backend/ names a family's folder in an #include: only the two tables
#     (backend/models/family_registry.cpp, backend/family_runtime.cpp) include a family; shared
#     code (checkpoint_layouts, the loop, nn/, io/) reaches a family through its record.
#  9. backend/models/ and backend/pipelines/ never include the Torch table
#     backend/family_runtime.h (the programs in app/ do): shared helpers of the families'
#     runtimes (dual_stream_runtime.h) include the record type. backend/pipelines/ never
#     includes the family table backend/models/family_registry.h either: a family's pipeline
#     hands the flow-matching loop its own record (FlowMatchPipeline's FamilySpec argument).
# 10. backend/nn/ (the shared layers) never includes backend/models/ or backend/pipelines/: the
#     models build on the layers; a seam a model fills (the attention step cache) is an interface
#     declared in nn/ (attention_output_cache.h) that the model side implements.
# 11. app/worker/ and app/bench/ (the ranks) never include app/launcher/ (dit_launcher, what starts
#     and drives groups): what a launcher and its ranks share, the wire (strategy flags, model
#     fingerprints and content hashes, the port probe's listener, the host-network advice), is
#     dit_protocol's (app/protocol/).
# Usage: layering_check.sh SOURCE_DIR. Prints every offending line; exits 1 if there is one.
set -uo pipefail
SRC=${1:?source dir}
fail=0
flux='to_q|to_k|to_v|to_out|add_[qkv]_proj|to_add_out|proj_mlp|proj_out|ff_context|ff\.net|norm1_context|norm_added|single_transformer_blocks|transformer_blocks|context_embedder|x_embedder|FluxTransformer|FluxSingle|FluxAttention|FluxPosEmbed'
if out=$(grep -rnE "$flux" "$SRC/parallel"); then
  echo "parallel/ names model layers (the model's plan must be the only place):"; echo "$out"; fail=1
fi
if out=$(grep -rnE '#include\s+"(backend|ui)/' "$SRC/parallel"); then
  echo "parallel/ includes backend/ or ui/:"; echo "$out"; fail=1
fi
if out=$(grep -rnE '#include\s+[<"](ATen|torch|c10|mpi\.h)' "$SRC/ui"); then
  echo "ui/ includes Torch or MPI headers:"; echo "$out"; fail=1
fi
if out=$(grep -rnE '#include\s+"(app|ui)/' "$SRC/parallel" "$SRC/backend"); then
  echo "parallel/ or backend/ includes app/ or ui/:"; echo "$out"; fail=1
fi
if out=$(grep -nE 'dit_(protocol|launcher|app|ui)\b' "$SRC/parallel/CMakeLists.txt"); then
  echo "parallel/ links a library of app/ or ui/:"; echo "$out"; fail=1
fi
if [ -d "$SRC/app/launcher" ] &&
   out=$(grep -rnE '#include\s+[<"](ATen|torch|c10|mpi\.h|Q[A-Z]|Qt)' "$SRC/app/launcher"); then
  echo "app/launcher/ includes Torch, MPI or Qt headers:"; echo "$out"; fail=1
fi
if [ -d "$SRC/app/server" ] &&
   out=$(grep -rnE '#include\s+[<"](ATen|torch|c10|mpi\.h|Q[A-Z]|Qt|backend/)' "$SRC/app/server"); then
  echo "app/server/ (dit_server) includes Torch, MPI, Qt or backend headers:"; echo "$out"; fail=1
fi
ranks=()
for d in app/worker app/bench; do [ -d "$SRC/$d" ] && ranks+=("$SRC/$d"); done
if [ ${#ranks[@]} -gt 0 ] &&
   out=$(grep -rnE '#include\s+[<"]app/launcher/' "${ranks[@]}"); then
  echo "app/worker/ or app/bench/ (the ranks) includes app/launcher/ (the wire they share with a launcher is app/protocol/'s):"
  echo "$out"; fail=1
fi
if out=$(grep -rnE '#include\s+"backend/(models|pipelines)/' "$SRC/backend/nn" 2>/dev/null); then
  echo "backend/nn/ includes backend/models/ or backend/pipelines/ (declare the seam in nn/):"; echo "$out"; fail=1
fi
if out=$(grep -rnE '#include\s+"backend/(models|pipelines)/' "$SRC/backend/io"); then
  echo "backend/io/ includes backend/models/ or backend/pipelines/:"; echo "$out"; fail=1
fi
# Family folders: backend/models/<f>/ with a <f>_family.cpp, and backend/pipelines/<f>/.
exclude=()
for fam in "$SRC"/backend/models/*/*_family.cpp; do
  [ -e "$fam" ] || continue
  f=$(basename "$(dirname "$fam")")
  exclude+=(--exclude-dir="$f")
done
if [ ${#exclude[@]} -eq 0 ]; then
  echo "no family folder found (backend/models/<f>/<f>_family.cpp)"; fail=1
fi
classes='"[A-Za-z0-9_]*(Pipeline|Transformer2DModel)"'
# (comments may name classes: the literal must come before any // on its line)
if out=$(grep -rnE "$classes" "${exclude[@]}" --include='*.cpp' --include='*.h' \
    "$SRC/app" "$SRC/ui" "$SRC/parallel" "$SRC/backend" |
    perl -ne 'my ($f, $l, $code) = /^([^:]*):(\d+):(.*)$/; $code =~ s{//.*}{}; print if $code =~ /"[A-Za-z0-9_]*(Pipeline|Transformer2DModel)"/'
    ) && [ -n "$out" ]; then
  echo "pipeline/transformer class names outside the family folders (ask the family record):"
  echo "$out"; fail=1
fi
rules='cfg_truncation|cfg_normalization|is_distilled|cfg_from_guidance|runsCfg|OptionMeanings|cfgPolicy|cfg-truncation|cfg-normalization|true_cfg_scale|true-cfg-scale'
if out=$(grep -rnE "$rules" "${exclude[@]}" --include='*.cpp' --include='*.h' --include='*.html' \
    --include='*.js' "$SRC/app" "$SRC/ui" "$SRC/parallel" "$SRC/backend" |
    perl -ne 'my ($f, $l, $code) = /^([^:]*):(\d+):(.*)$/; $code =~ s{//.*}{}; $code =~ s{^\s*\*.*}{}; print if $code =~ /cfg_truncation|cfg_normalization|is_distilled|cfg_from_guidance|runsCfg|OptionMeanings|cfgPolicy|cfg-truncation|cfg-normalization|true_cfg_scale|true-cfg-scale/'
    ) && [ -n "$out" ]; then
  echo "family-specific request rules outside the family folders (declare them in the family's RequestSpec):"
  echo "$out"; fail=1
fi
families=()
for fam in "$SRC"/backend/models/*/*_family.cpp; do
  [ -e "$fam" ] || continue
  f=$(basename "$(dirname "$fam")")
  families+=("$f")
  dirs=("$SRC/backend/models/$f")
  [ -d "$SRC/backend/pipelines/$f" ] && dirs+=("$SRC/backend/pipelines/$f")
  if out=$(grep -rnE '#include\s+"backend/(models/family_registry|family_runtime)\.h"' "${dirs[@]}"); then
    echo "a family's folder includes a family table (the tables include the families):"
    echo "$out"; fail=1
  fi
done
if [ ${#families[@]} -gt 0 ]; then
  famre=$(IFS='|'; echo "${families[*]}")
  if out=$(grep -rnE "#include\s+\"backend/(models|pipelines)/($famre)/" "${exclude[@]}" \
      --exclude=family_registry.cpp --exclude=family_runtime.cpp "$SRC/backend"); then
    echo "shared backend code includes a family's folder (only the two family tables do):"
    echo "$out"; fail=1
  fi
fi
if out=$(grep -rnE '#include\s+"backend/models/family_registry\.h"' "$SRC/backend/pipelines" \
    2> /dev/null); then
  echo "backend/pipelines/ includes the family table (the loop gets its record from the family's pipeline):"
  echo "$out"; fail=1
fi
if out=$(grep -rnE '#include\s+"backend/family_runtime\.h"' "$SRC/backend/models" \
    "$SRC/backend/pipelines" 2>/dev/null); then
  echo "backend/models/ or backend/pipelines/ includes the Torch family table (include backend/family_runtime_record.h):"
  echo "$out"; fail=1
fi
[ $fail -eq 0 ] && echo "layering: parallel/ model-free and backend-free, parallel/ and backend/ app-free, ui/ and app/launcher/ Torch-free, backend/io/ family-free, backend/nn/ model-free, class names and family request rules only in family folders, the family tables include the families and nothing else does, the ranks (app/worker/, app/bench/) launcher-free"
exit $fail
