// The AUTOMATIC1111 subset: txt2img, img2img, progress and interrupt.
#include <algorithm>

#include "app/server/http_routes.h"

namespace dit::server {

using nlohmann::json;

// --- AUTOMATIC1111 --------------------------------------------------------------------------
ImagesCall Handlers::sdapiCall(const json& b, const std::string& api) {
  ImagesCall c;
  c.job.api = api;
  auto& p = c.job.request.params;
  if (auto v = str(b, "prompt")) p.prompt = *v;
  if (auto v = number(b, "distilled_guidance")) p.guidance = *v;
  // The guarded body itself, never a copy of it (issue 48: copies and dumps of client bodies).
  applyDitFields(b, p, c.echo);
  // cfg_scale is the model's CFG scale, whichever field its family's guider reads (the resolve
  // maps the option kCfgScaleOption onto it: FLUX.1's true CFG scale, klein's guidance, ...).
  if (auto v = number(b, "cfg_scale")) p.options[kCfgScaleOption] = *v, c.echo["cfg_scale"] = *v;
  // A1111 clients send negative_prompt "" by default: that is no negative prompt. (Not echoed:
  // A1111's info carries the request's own fields.)
  if (p.negative_prompt_given && p.negative_prompt.empty()) p.negative_prompt_given = false;
  c.echo.erase("negative_prompt");
  if (auto v = number(b, "denoising_strength")) p.strength = *v, c.echo["strength"] = *v;
  const long long batch = integer(b, "batch_size", 1, opt.max_n).value_or(1);
  const long long iter = integer(b, "n_iter", 1, opt.max_n).value_or(1);
  if (batch * iter > opt.max_n)
    throw badRequest("batch_size x n_iter must be at most " + std::to_string(opt.max_n),
                     "batch_size");
  p.num_images = static_cast<int>(batch * iter);
  if (auto w = integer(b, "width", 1, opt.max_side)) p.width = static_cast<int>(*w);
  if (auto h = integer(b, "height", 1, opt.max_side)) p.height = static_cast<int>(*h);
  if (auto m = str(b, "model")) c.job.model = *m;
  return c;
}

// `body` is the request's own parsed JSON, moved in: echoed as "parameters" without the images.
void Handlers::sdapiRespond(httplib::Response& res, ImagesCall& c, json body) {
  auto job = submit(c);
  std::vector<JobImage> imgs;
  {
    std::unique_lock lock(pool.mutex());
    waitFinished(lock, job);
    if (job->state != JobState::Done) throw jobError(*job);
    imgs = sortedImages(*job);
  }
  json images = json::array(), seeds = json::array();
  for (const JobImage& img : imgs) {
    images.push_back(encodeBase64(outputImage(img, "png", 100).first));
    seeds.push_back(img.has_seed ? json(img.seed) : json(nullptr));
  }
  json info = madeEcho(c, imgs);
  info["prompt"] = c.job.request.params.prompt;
  info["all_seeds"] = seeds;
  info["job"] = job->id;
  body.erase("init_images");
  body.erase("mask");
  sendJson(
      res, 200,
      json{{"images", std::move(images)}, {"parameters", std::move(body)}, {"info", info.dump()}});
}

void Handlers::txt2img(const httplib::Request& req, httplib::Response& res) {
  json b = parseBody(req, opt.max_json_depth, BodyKind::Sdapi);
  ImagesCall c = sdapiCall(b, "sdapi.txt2img");
  sdapiRespond(res, c, std::move(b));
}

void Handlers::img2img(const httplib::Request& req, httplib::Response& res) {
  json b = parseBody(req, opt.max_json_depth, BodyKind::SdapiImg2Img);
  ImagesCall c = sdapiCall(b, "sdapi.img2img");
  if (!b.contains("init_images") || !b["init_images"].is_array() || b["init_images"].empty() ||
      !b["init_images"][0].is_string())
    throw badRequest("'init_images' must be an array of base64 images", "init_images");
  const bool hasMask = b.contains("mask") && b["mask"].is_string() &&
                       !b["mask"].get_ref<const std::string&>().empty();
  if (imagesAreReferences(c, b, hasMask, "init_images")) {
    // Editing: every init image is a reference image, in order.
    const std::vector<std::string> decoded = jsonImages(b, "init_images");
    std::vector<const std::string*> images;
    for (const std::string& d : decoded) images.push_back(&d);
    attachReferences(c, images, "init_images");
    sdapiRespond(res, c, std::move(b));
    return;
  }
  if (b["init_images"].size() > 1)
    throw badRequest(
        "only one init image is accepted per request (several are reference images, which only "
        "editing models take)",
        "init_images");
  std::string mask;
  if (b.contains("mask") && !b["mask"].is_null()) {  // read in place: no copy of the upload
    if (!b["mask"].is_string())
      throw badRequest("'mask' must be a string, got " + typeName(b["mask"]), "mask");
    if (const std::string& m = b["mask"].get_ref<const std::string&>(); !m.empty())
      mask = decodeBase64(m, "mask");
  }
  std::string image;
  try {
    image = decodeBase64(b["init_images"][0].get_ref<const std::string&>(), "init_images[0]");
    if (!mask.empty() && b.value("inpainting_mask_invert", 0) == 1) {
      Pixels m = inpaintMask(decodeImage(mask, "mask", opt.max_side, opt.max_upload_pixels));
      for (auto& v : m.data) v = static_cast<std::uint8_t>(255 - v);
      mask = encodeImage(m, "png", 100);
    }
  } catch (const ImageError& e) {
    throw badRequest(e.what(), "init_images");
  }
  // A1111 masks are white = repaint already: no alpha conversion unless the mask has alpha.
  attachImages(c, image, mask, "init_images[0]", "mask");
  sdapiRespond(res, c, std::move(b));
}

void Handlers::progress(const httplib::Request&, httplib::Response& res) {
  json out{
      {"progress", 0.0}, {"eta_relative", 0.0}, {"current_image", nullptr}, {"textinfo", nullptr}};
  int jobCount = 0;
  const Job* best = nullptr;
  json state{{"skipped", false},   {"interrupted", false}, {"job", ""},
             {"job_count", 0},     {"job_timestamp", "0"}, {"job_no", 0},
             {"sampling_step", 0}, {"sampling_steps", 0}};
  pool.forEachJob([&](const Job& j) {
    if (j.finished()) return;
    ++jobCount;
    if (j.state == JobState::Running &&
        (!best || (j.api.rfind("sdapi", 0) == 0 && best->api.rfind("sdapi", 0) != 0)))
      best = &j;
    if (best) {
      const int n = std::max(1, best->request.imageCount());
      const double perImage = best->steps > 0 ? double(best->step) / best->steps : 0.0;
      out["progress"] = (best->image_index + perImage) / n;
      out["eta_relative"] = best->eta_s > 0 ? best->eta_s : 0.0;
      state["job"] = best->id;
      state["sampling_step"] = best->step;
      state["sampling_steps"] = best->steps;
      state["job_timestamp"] = std::to_string(best->created);
      if (!best->preview_list.empty()) out["current_image"] = best->preview_list.back().png_b64;
    }
  });
  state["job_count"] = jobCount;
  out["state"] = state;
  sendJson(res, 200, out);
}

void Handlers::interrupt(const httplib::Request&, httplib::Response& res) {
  std::vector<std::string> ids;
  pool.forEachJob([&](const Job& j) {
    if (j.state == JobState::Running && j.api.rfind("sdapi", 0) == 0) ids.push_back(j.id);
  });
  for (const auto& id : ids) pool.cancel(id);
  sendJson(res, 200, json{{"interrupted", ids}});
}

}  // namespace dit::server
