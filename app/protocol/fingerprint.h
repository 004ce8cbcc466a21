// Compatibility header: the model fingerprint moved to dit_launcher (app/launcher/fingerprint.h,
// namespace dit::launcher). This path and the dit::protocol names stay for the existing tests;
// new code includes app/launcher/fingerprint.h. Linking needs dit_launcher.
#pragma once

#include "app/launcher/fingerprint.h"

namespace dit::protocol {
using launcher::describeDifferences;
using launcher::FileFingerprint;
using launcher::modelFileFingerprints;
using launcher::modelFingerprint;
}  // namespace dit::protocol
