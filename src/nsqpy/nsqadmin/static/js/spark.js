// Inline SVG sparklines drawn from /api/history points.
import { raw } from "./html.js";
import { commafy, rate } from "./format.js";

// A polyline of points[i][key], scaled to the box; the last value is the tooltip.
export function sparkline(points, key, cls, width = 120, height = 20) {
  const values = (points || []).map((p) => Number(p[key]) || 0);
  if (values.length < 2) {
    return raw(
      `<svg class="spark empty" width="${width}" height="${height}" role="img">` +
        `<title>collecting data…</title></svg>`,
    );
  }
  const max = Math.max(...values, 1e-9);
  const step = (width - 2) / (values.length - 1);
  const coords = values
    .map((v, i) => {
      const x = 1 + i * step;
      const y = height - 1 - (v / max) * (height - 2);
      return x.toFixed(1) + "," + y.toFixed(1);
    })
    .join(" ");
  const last = values[values.length - 1];
  const isCount = key === "depth" || key === "queued";
  const label = isCount ? commafy(last) + " msgs" : rate(last) + " msgs/s";
  return raw(
    `<svg class="spark" data-key="${key}" width="${width}" height="${height}" role="img"` +
      ` viewBox="0 0 ${width} ${height}" preserveAspectRatio="none">` +
      `<title>${label}, max ${isCount ? commafy(max) : rate(max)}</title>` +
      `<polyline class="${cls}" points="${coords}"/></svg>`,
  );
}
