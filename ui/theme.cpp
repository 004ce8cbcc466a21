#include "ui/theme.h"

#include <QApplication>
#include <QPalette>
#include <QStyleFactory>

namespace dit::ui {

void applyDarkTheme(QApplication& app) {
  app.setStyle(QStyleFactory::create(QStringLiteral("Fusion")));
  QPalette p;
  const QColor window(0x1e, 0x20, 0x24), base(0x16, 0x18, 0x1b), text(0xe3, 0xe6, 0xea),
      accent(0x4c, 0x9a, 0xff), mid(0x2a, 0x2d, 0x33);
  p.setColor(QPalette::Window, window);
  p.setColor(QPalette::WindowText, text);
  p.setColor(QPalette::Base, base);
  p.setColor(QPalette::AlternateBase, mid);
  p.setColor(QPalette::ToolTipBase, mid);
  p.setColor(QPalette::ToolTipText, text);
  p.setColor(QPalette::PlaceholderText, QColor(0x80, 0x86, 0x8f));
  p.setColor(QPalette::Text, text);
  p.setColor(QPalette::Button, mid);
  p.setColor(QPalette::ButtonText, text);
  p.setColor(QPalette::BrightText, QColor(0xff, 0x6b, 0x6b));
  p.setColor(QPalette::Highlight, accent);
  p.setColor(QPalette::HighlightedText, Qt::white);
  p.setColor(QPalette::Link, accent);
  p.setColor(QPalette::Disabled, QPalette::Text, QColor(0x6a, 0x6f, 0x78));
  p.setColor(QPalette::Disabled, QPalette::ButtonText, QColor(0x6a, 0x6f, 0x78));
  p.setColor(QPalette::Disabled, QPalette::WindowText, QColor(0x6a, 0x6f, 0x78));
  app.setPalette(p);
  app.setStyleSheet(QStringLiteral(R"(
    QGroupBox { border: 1px solid #33373e; border-radius: 6px; margin-top: 14px; padding: 8px 6px 6px 6px; }
    QGroupBox::title { subcontrol-origin: margin; left: 10px; padding: 0 4px; color: #9aa4b2; }
    QToolBar { border: none; spacing: 6px; padding: 4px; background: #1a1c20; }
    QToolButton { padding: 4px 10px; border-radius: 4px; }
    QToolButton:hover { background: #2f343c; }
    QToolButton:disabled { color: #5d636b; }
    QTabWidget::pane { border: 1px solid #33373e; border-radius: 4px; }
    QTabBar::tab { padding: 6px 12px; background: #23262b; border: 1px solid #33373e; border-bottom: none; }
    QTabBar::tab:selected { background: #2d3138; color: #ffffff; }
    QProgressBar { border: 1px solid #33373e; border-radius: 4px; text-align: center; background: #16181b; }
    QProgressBar::chunk { background: #4c9aff; border-radius: 3px; }
    QLabel#issues { color: #ff8a80; }
    QLabel#hint { color: #9aa4b2; }
    QFrame#banner { background: #4a1f24; border: 1px solid #a8444f; border-radius: 6px; }
    QFrame#banner[severity="warning"] { background: #4a3d1f; border: 1px solid #a88a44; }
    QFrame#banner QLabel { color: #ffe3e0; }
    QListWidget#gallery { background: #131417; }
    QPlainTextEdit#log { font-family: monospace; font-size: 9pt; }
  )"));
}

}  // namespace dit::ui
