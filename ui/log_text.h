// Text of a worker/mpirun output line as the log shows it: binary payloads never reach the log.
#pragma once

#include <QByteArray>
#include <QString>

namespace dit::ui {

/// A stdout/stderr line for the log. A line that holds a piece of an event (an "@@DIT " marker
/// that did not parse: mpirun cut it, or the group was killed mid-line, e.g. a preview's base64
/// PNG) is summarised as "[cut worker event "preview", 48213 bytes not shown]"; a run of 120 or
/// more base64 characters is replaced by "[N bytes of binary data not shown]"; lines longer than
/// 2000 characters are cut with the count of what was left out. Invalid UTF-8 is replaced.
QString logText(const QByteArray& line);

}  // namespace dit::ui
