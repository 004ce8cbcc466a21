#include "ui/log_panel.h"

#include <QComboBox>
#include <QHBoxLayout>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QScrollBar>
#include <QTime>
#include <QVBoxLayout>

namespace dit::ui {

LogPanel::LogPanel(QWidget* parent) : QWidget(parent) {
  auto* lay = new QVBoxLayout(this);
  lay->setContentsMargins(0, 0, 0, 0);
  auto* row = new QHBoxLayout;
  filter_ = new QComboBox(this);
  filter_->addItem(tr("all ranks"), -2);
  filter_->addItem(tr("launcher (mpirun, GUI)"), -1);
  auto* clearBtn = new QPushButton(tr("Clear"), this);
  row->addWidget(filter_);
  row->addStretch(1);
  row->addWidget(clearBtn);
  lay->addLayout(row);
  view_ = new QPlainTextEdit(this);
  view_->setObjectName("log");
  view_->setReadOnly(true);
  view_->setMaximumBlockCount(5000);
  view_->setLineWrapMode(QPlainTextEdit::WidgetWidth);
  lay->addWidget(view_, 1);
  connect(filter_, &QComboBox::currentIndexChanged, this, [this] { refilter(); });
  connect(clearBtn, &QPushButton::clicked, this, &LogPanel::clear);
}

QString LogPanel::format(const Line& l) const {
  const QString who = l.rank < 0 ? QStringLiteral("group") : QStringLiteral("rank %1").arg(l.rank);
  return QStringLiteral("[%1] %2: %3").arg(who, l.level, l.text);
}

bool LogPanel::passes(const Line& l) const {
  const int f = filter_->currentData().toInt();
  return f == -2 || f == l.rank;
}

void LogPanel::append(int rank, const QString& level, const QString& message) {
  Line l{rank, level, message};
  lines_.append(l);
  if (lines_.size() > 20000) lines_.removeFirst();
  if (rank >= 0) setWorld(rank + 1);
  if (!passes(l)) return;
  view_->appendPlainText(format(l));
  // An error is scrolled into view even when the reader had scrolled up.
  if (level == QLatin1String("error") || level == QLatin1String("fatal"))
    view_->verticalScrollBar()->setValue(view_->verticalScrollBar()->maximum());
}

void LogPanel::setWorld(int world) {
  const int have = filter_->count() - 2;
  for (int r = have; r < world; ++r) filter_->addItem(tr("rank %1").arg(r), r);
}

void LogPanel::clear() {
  lines_.clear();
  view_->clear();
}

QString LogPanel::text() const {
  QStringList out;
  for (const Line& l : lines_) out << format(l);
  return out.join('\n');
}

void LogPanel::refilter() {
  view_->clear();
  for (const Line& l : lines_)
    if (passes(l)) view_->appendPlainText(format(l));
}

}  // namespace dit::ui
