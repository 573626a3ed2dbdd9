// The one script of the console: the "select all" box of a dead-letter list.
document.addEventListener("DOMContentLoaded", () => {
  const all = document.getElementById("select-all");
  if (all) all.addEventListener("change", () => document.querySelectorAll("input.pick").forEach((b) => { b.checked = all.checked; }));
});
