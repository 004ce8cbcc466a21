#include "app/demo/shapes_draw.h"

#include <QColor>
#include <QImage>
#include <QPainter>
#include <QPainterPath>
#include <QPointF>
#include <QPolygonF>
#include <QRectF>
#include <cmath>
#include <cstring>

namespace dit::demo {

std::vector<uint8_t> drawScene(const ShapeScene& s, int width, int height) {
  QImage img(width, height, QImage::Format_RGB888);
  const auto bg = colourRgb(s.background), fg = colourRgb(s.colour);
  img.fill(QColor(bg[0], bg[1], bg[2]));
  {
    QPainter p(&img);
    p.setRenderHint(QPainter::Antialiasing, true);
    p.setPen(Qt::NoPen);
    p.setBrush(QColor(fg[0], fg[1], fg[2]));
    const ShapeLayout l = layout(s, width, height);
    const double r = l.radius;
    for (const auto& [cx, cy] : l.centres) {
      switch (s.shape) {
        case 0:
          p.drawEllipse(QPointF(cx, cy), r, r);
          break;
        case 1:
          p.drawRect(QRectF(cx - 0.9 * r, cy - 0.9 * r, 1.8 * r, 1.8 * r));
          break;
        case 2:
          p.drawPolygon(QPolygonF({QPointF(cx, cy - r), QPointF(cx + r, cy + 0.85 * r),
                                   QPointF(cx - r, cy + 0.85 * r)}));
          break;
        default: {
          QPolygonF star;
          for (int k = 0; k < 10; ++k) {
            const double a = -M_PI / 2 + k * M_PI / 5, rr = k % 2 ? 0.45 * r : 1.1 * r;
            star << QPointF(cx + rr * std::cos(a), cy + 0.1 * r + rr * std::sin(a));
          }
          p.drawPolygon(star);
        }
      }
    }
  }
  std::vector<uint8_t> out(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y)
    std::memcpy(out.data() + static_cast<size_t>(y) * width * 3, img.constScanLine(y),
                static_cast<size_t>(width) * 3);
  return out;
}

}  // namespace dit::demo
