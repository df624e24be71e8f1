// Number and duration formatting shared by every page.

export function commafy(n) {
  const value = Math.round(Number(n) || 0);
  return value.toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

function round(value, places) {
  const m = 10 ** places;
  return Math.round(value * m) / m;
}

const NS_PER_US = 1e3;
const NS_PER_MS = 1e6;
const NS_PER_S = 1e9;
const NS_PER_MIN = 60 * NS_PER_S;
const NS_PER_HOUR = 60 * NS_PER_MIN;

// Nanoseconds as Go nsqadmin shows them (1h2m3s, 41.33s, 230.26ms, 682.8us, 0ns), except
// that what is left after whole minutes is always seconds: 2m0.68s, not Go's 2m682.48ms.
export function duration(ns) {
  let n = Number(ns) || 0;
  let prefix = "";
  if (n >= NS_PER_HOUR) {
    prefix += Math.floor(n / NS_PER_HOUR) + "h";
    n %= NS_PER_HOUR;
  }
  if (n >= NS_PER_MIN || prefix) {
    prefix += Math.floor(n / NS_PER_MIN) + "m";
    n %= NS_PER_MIN;
  }
  if (prefix) {
    return prefix + round(n / NS_PER_S, 2) + "s";
  }
  if (n >= NS_PER_S) {
    return round(n / NS_PER_S, 2) + "s";
  }
  if (n >= NS_PER_MS) {
    return round(n / NS_PER_MS, 2) + "ms";
  }
  if (n >= NS_PER_US) {
    return round(n / NS_PER_US, 2) + "us";
  }
  return Math.round(n) + "ns";
}

// Messages per second: two decimals below 10, one below 100, then whole numbers.
export function rate(value) {
  if (value === null || value === undefined || Number.isNaN(Number(value))) {
    return "–";
  }
  const r = Number(value);
  if (r === 0) {
    return "0";
  }
  if (r < 10) {
    return r.toFixed(2);
  }
  if (r < 100) {
    return r.toFixed(1);
  }
  return commafy(r);
}

// "5s ago", "3m ago" for the refresh indicator.
export function ago(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) {
    return s + "s ago";
  }
  if (s < 3600) {
    return Math.floor(s / 60) + "m ago";
  }
  return Math.floor(s / 3600) + "h ago";
}

export function percentLabel(quantile) {
  const p = Math.floor(quantile * 100);
  const last = p % 100 >= 11 && p % 100 <= 13 ? 0 : p % 10;
  const suffix = last === 1 ? "st" : last === 2 ? "nd" : last === 3 ? "rd" : "th";
  return [p, suffix];
}
