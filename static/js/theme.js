// Light or dark: the system's setting until the user picks one with the toggle in the top bar;
// the pick is remembered in this browser (localStorage). Runs in <head>, before the first paint,
// so it sets <html data-theme> at once and adds the toggle when the page is parsed.
(function () {
  "use strict";
  const KEY = "sluice-theme";
  const root = document.documentElement;
  const system = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;

  function chosen() {
    try { return localStorage.getItem(KEY); } catch (e) { return null; }
  }
  function effective() {
    const pick = chosen();
    if (pick === "dark" || pick === "light") return pick;
    return system && system.matches ? "dark" : "light";
  }
  function apply() {
    const theme = effective();
    root.dataset.theme = theme;
    const button = document.getElementById("theme-toggle");
    if (button) {
      button.setAttribute("aria-pressed", theme === "dark" ? "true" : "false");
      button.title = chosen() ? "Colour scheme chosen here" : "Following the system's colour scheme";
    }
  }
  apply();
  if (system && system.addEventListener) system.addEventListener("change", apply);
  // Another tab changed the pick.
  window.addEventListener("storage", function (event) { if (event.key === KEY) apply(); });

  function toggle() {
    const next = effective() === "dark" ? "light" : "dark";
    try {
      // Back to the system's setting when the pick matches it, so a later system change counts.
      if (system && (system.matches ? "dark" : "light") === next) localStorage.removeItem(KEY);
      else localStorage.setItem(KEY, next);
    } catch (e) { /* private mode: for this page only */ }
    root.dataset.theme = next;
    apply();
    if (root.dataset.theme !== next) root.dataset.theme = next;
  }

  document.addEventListener("DOMContentLoaded", function () {
    const nav = document.querySelector(".topbar nav");
    if (!nav) return;
    const button = document.createElement("button");
    button.type = "button";
    button.id = "theme-toggle";
    button.className = "theme-toggle";
    button.textContent = "◐";
    button.setAttribute("aria-label", "Dark mode");
    button.addEventListener("click", toggle);
    nav.insertBefore(button, nav.firstChild);
    apply();
  });
})();
