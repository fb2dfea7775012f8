-- Argo CD health check for oxbow.dev/StreamApp. It reads the kstatus conditions the
-- operator writes, so Argo CD, Flux and `kubectl wait --for=condition=Ready` agree.
-- Install: see gitops/argocd/argocd-cm.yaml and docs/gitops.md.
local hs = {}

local function condition(t)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == t then
      return c
    end
  end
  return nil
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Oxbow operator to report"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "The operator has not acted on the latest spec yet (generation " ..
    obj.metadata.generation .. ", observed " .. obj.status.observedGeneration .. ")"
  return hs
end

local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.reason .. ": " .. (stalled.message or "")
  return hs
end

local tasks = condition("TasksAssigned")
if tasks ~= nil and tasks.status == "False" and tasks.reason == "TaskFailed" then
  hs.status = "Degraded"
  hs.message = tasks.reason .. ": " .. (tasks.message or "")
  return hs
end

local ready = condition("Ready")
if ready ~= nil and ready.status == "True" then
  if obj.spec ~= nil and obj.spec.replicas == 0 then
    hs.status = "Suspended"
    hs.message = "Scaled to zero: no worker runs, state is kept"
  else
    hs.status = "Healthy"
    hs.message = ready.message or "Ready"
  end
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = ready.reason .. ": " .. (ready.message or "")
else
  hs.message = "Waiting for the Ready condition"
end
return hs
