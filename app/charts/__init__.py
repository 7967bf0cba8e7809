"""Dashboard charts (pyqtgraph). They read a MetricStore on a redraw timer; they never block."""
