//! What the web pages are made of, bundled into the binary: nothing is fetched from outside.

/// `trainyard dashboard`'s page.
pub(crate) const DASHBOARD_PAGE: &str = include_str!("../assets/dashboard.html");
/// `trainyard show --html`'s page, with `{{NAME}}`, `{{UPLOT_CSS}}`, `{{UPLOT_JS}}`,
/// `{{CHARTS_JS}}` and `{{SHOWN}}` to fill in.
pub(crate) const SHOW_PAGE: &str = include_str!("../assets/show.html");
/// uPlot 1.6.32 (MIT, <https://github.com/leeoniya/uPlot>): the charts.
pub(crate) const UPLOT_JS: &str = include_str!("../assets/uplot/uPlot.iife.min.js");
pub(crate) const UPLOT_CSS: &str = include_str!("../assets/uplot/uPlot.min.css");
/// The charts of a metrics history, on uPlot: shared by both pages.
pub(crate) const CHARTS_JS: &str = include_str!("../assets/charts.js");
