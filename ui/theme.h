// The dark look: Fusion style, a dark palette and a small style sheet.
#pragma once

class QApplication;

namespace dit::ui {

/// Applies the DiT Studio dark theme to `app`.
void applyDarkTheme(QApplication& app);

}  // namespace dit::ui
