"""The compile report's stylesheet (inlined into the page)."""

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1100px;
       padding: 0 16px; color: #1f2328; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid #d0d7de; }
h4 { margin: 12px 0 4px; font-size: 13px; }
.meta, .dim { color: #656d76; font-weight: normal; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { text-align: left; padding: 3px 10px; border-bottom: 1px solid #eaeef2; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.summary th { font-weight: 600; width: 180px; }
pre { background: #f6f8fa; padding: 8px 10px; border-radius: 6px; overflow-x: auto; font-size: 12px;
      line-height: 1.35; max-height: 480px; margin: 4px 0; }
code { font-size: 12px; }
details { margin: 4px 0; } details > summary { cursor: pointer; padding: 3px 0; }
details.graph { border: 1px solid #d0d7de; border-radius: 6px; padding: 4px 10px; margin: 8px 0; }
details.graph > summary { font-weight: 600; }
details.stage, details.guards, details.cache { margin-left: 8px; }
.program { border-left: 3px solid #d0d7de; padding-left: 10px; margin: 8px 0; }
.badge { display: inline-block; font-size: 11px; font-weight: 500; padding: 0 6px; margin-left: 6px;
         border-radius: 10px; background: #ddf4ff; color: #0969da; }
.badge.warn { background: #fff8c5; color: #7d4e00; } .badge.bad { background: #ffebe9; color: #cf222e; }
.badge.ok { background: #dafbe1; color: #1a7f37; }
ol.events li { margin: 4px 0; } .reason { font-weight: 600; } .where { color: #656d76; margin-left: 8px; }
p.break, p.recompile, p.eager { margin: 4px 0; padding: 4px 8px; border-radius: 4px; background: #fff8c5; }
p.eager { background: #ffebe9; }
details.error { background: #ffebe9; border-radius: 6px; padding: 4px 10px; }
table.source td.where { white-space: nowrap; font-size: 12px; }
svg.chart text { font-size: 12px; fill: #1f2328; }
"""
